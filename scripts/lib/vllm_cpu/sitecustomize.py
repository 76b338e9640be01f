"""Loaded into every process of the parity suite's vLLM (scripts/vllm-serve puts this folder on
PYTHONPATH): it mends one bug of vLLM 0.32's CPU build that kills its engine, and changes nothing
the engine counts.

The bug: on a CPU with AVX-512 BF16, a Gated DeltaNet layer hands the C++ causal_conv1d_fwd_cpu
its prefill tokens as a transposed [channels, tokens] view. When the batch is a single prefill of
a single token (a one-token prompt that no other request shares a step with), PyTorch gives the
[1, channels] tensor before the transpose strides of (1, 1); the kernel's stride check refuses it
("causal_conv1d_fwd_cpu: expect x to be transposed") and the engine core dies, so every later
request gets a 500. The mend copies such an input into the layout the kernel expects (same
values) before the call.
"""

import importlib.abc
import importlib.machinery
import sys

MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"


def mend(module):
    import torch

    conv = module._causal_conv1d_fwd_cpu

    def causal_conv1d_fwd_cpu(*, x, **rest):
        if x.dim() == 2 and x.stride() != (1, x.size(0)):
            laid = torch.empty_strided(x.shape, (1, x.size(0)), dtype=x.dtype, device=x.device)
            x = laid.copy_(x)
        return conv(x=x, **rest)

    module._causal_conv1d_fwd_cpu = causal_conv1d_fwd_cpu


class Finder(importlib.abc.MetaPathFinder):
    """Finds the module as Python would, and mends it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            mend(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, Finder())
