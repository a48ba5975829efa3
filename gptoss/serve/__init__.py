"""gptoss.serve: the gptoss engine over HTTP (SGLang's /generate, OpenAI's /v1/completions)."""
