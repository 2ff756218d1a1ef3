"""Run the Triton kernels on the CPU through Triton's interpreter (it must be set before triton is imported)."""

import os

os.environ["TRITON_INTERPRET"] = "1"
