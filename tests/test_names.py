"""Display forms of long kernel names and rank lists."""

import pytest

from distprof.analysis.names import display_name, rank_ranges

FBGEMM = ("void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<c10::Half, float, "
          "c10::Half, 2ul, 32>(at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, long>, bool, float)")


@pytest.mark.parametrize("name,limit,want", [
    ("aten::mm", 80, "aten::mm"),
    ("x" * 80, 80, "x" * 80),
    ("void k<int, float>(float*, int)" + "_" * 60, 70, "k<…>(…)" + "_" * 60),
    # collapsed to 62 characters, still over 60: the middle is elided (30 head + … + 29 tail)
    ("void kernel_name_long<int, std::pair<int, int>>(float*)" + "_" * 40, 60,
     "kernel_name_long<…>(…)" + "_" * 8 + "…" + "_" * 29),
])
def test_display_name_table(name, limit, want):
    assert display_name(name, limit) == want
    assert len(want) <= limit


def test_display_name_real_kernel_keeps_head_and_tail():
    got = display_name(FBGEMM, 80)
    assert len(got) <= 80 and got.startswith("split_embedding_backward_codegen") and got.endswith("<…>(…)")
    assert "GenericPackedTensorAccessor" not in got


def test_display_name_unbalanced_text_is_elided_not_mangled():
    got = display_name("f(" + "a" * 200, 50)
    assert len(got) == 50 and "…" in got and got.startswith("f(aaa")


@pytest.mark.parametrize("ranks,want", [
    ([], ""), ([3], "3"), ([0, 1, 2, 5, 7, 8], "0-2, 5, 7-8"), ([9, 1, 0, 1], "0-1, 9"), (range(2, 128), "2-127"),
])
def test_rank_ranges(ranks, want):
    assert rank_ranges(ranks) == want
