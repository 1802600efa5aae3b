// Precompiled header: the LibTorch headers nearly every translation unit needs.
#pragma once
#include <ATen/ATen.h>             // defines: at::Tensor, ATen ops
#include <torch/nn/module.h>       // defines: torch::nn::Module
#include <torch/types.h>           // defines: torch::Tensor aliases
#include <string>
#include <vector>
#include <memory>
