"""Registers the shipped result-file formats, in the order detection tries them (the most
specific first: a genai-perf or GuideLLM file is never mistaken for a vLLM one)."""
from calibrate.runs import genai_perf, guidellm, sglang, vllm  # noqa: F401
