"""Placeholder: the blocked kernel falls back to the simple one until it lands."""
from . import gemm


def conv(xp, wp, stride, padding, dilation, out_h, out_w, a):
    gemm._conv_simple(xp, wp, stride, padding, dilation, out_h, out_w, a)
