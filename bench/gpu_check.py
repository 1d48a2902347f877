"""The GPU check for a lent machine, from a checkout: `kuberl gpu-check` (engine/runtime/gpu_check.py), which the
GPU trainer image runs on a cluster's GPU node. Same arguments:

    python bench/gpu_check.py                        # on the GPU: SmolLM2 in bf16, every check
    python bench/gpu_check.py --cpu --model DIR      # the same code on CPU in fp32, less the device-memory checks
"""

import sys

from kuberl.engine.runtime.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
