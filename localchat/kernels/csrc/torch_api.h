// The parts of torch the kernels take: tensors and their factories under torch::, at::parallel_for, and
// pybind11 with torch's tensor casters. (<torch/extension.h> adds the whole C++ frontend, nn, optim and data
// among it, which took 15 of each build's 40 seconds of parsing and none of which the kernels use.)
#pragma once
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>
