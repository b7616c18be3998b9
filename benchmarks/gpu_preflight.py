"""Run a module as on the `device` tool's GPU image (issue 27): the packages that image lacks
(docs: /work/.library/device/KINDS.md) are refused at import, so a script that would fail there
fails here first, at no device time. benchmarks/gpu_carry.sh runs it.

    python benchmarks/gpu_preflight.py [-m] MODULE ARGS...
"""
import importlib.abc
import os
import runpy
import sys

MISSING = {"tensorflow_datasets", "gguf", "array_record", "importlib_resources",
           "jax_privacy"}
# packages a device call carries (benchmarks/gpu_carry_teacher.sh carries gguf): GPU_PREFLIGHT_ALLOW=a,b
MISSING -= set(filter(None, os.environ.get("GPU_PREFLIGHT_ALLOW", "").split(",")))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MISSING:
            raise ImportError(f"blocked (absent on the GPU image): {name}")
        return None
sys.meta_path.insert(0, Block())
args = sys.argv[1:]
if args[0] == "-m":
    args = args[1:]
mod = args[0]
sys.argv = [mod] + args[1:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
