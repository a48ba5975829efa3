"""`python -m gptoss.make_lora`: a random PEFT LoRA adapter for a checkpoint (gptoss.tools.make_lora)."""

import sys

from gptoss.tools.make_lora import main

if __name__ == "__main__":
    sys.exit(main())
