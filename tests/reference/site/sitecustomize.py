# Imported by every Python process the tests start (tests/CMakeLists.txt puts this folder on
# PYTHONPATH). bitsandbytes (the QLoRA reference) logs a warning at import on AVX512-BF16 CPUs
# when its optional `kernels` package is absent; transformers imports it, and the C++ tests read
# the scripts' stdout and stderr together, so that line would land in the values they parse.
import logging

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
