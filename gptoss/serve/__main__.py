"""`python -m gptoss.serve`: see gptoss/serve/main.py."""

from gptoss.serve.main import main

main()
