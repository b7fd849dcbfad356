"""A training package started as a module, as torchtitan and many in-house trainers are:

    torchrun --standalone --nproc_per_node=2 -m distprof.launch -m pkgtrain --steps 12
    torchrun --standalone --nproc_per_node=2 -m distprof.launch -m pkgtrain.train --steps 12

(from the directory that holds pkgtrain/, as `python -m` needs). Its modules import each other relatively
(`from .model import ...`), which works only when it runs as a module of its package.
"""
