"""Peer engines: other servers run on the same weights, for side-by-side benchmarks.

`hf_export` writes a model (e.g. `random:<preset>`) as a Hugging Face
directory; `gguf_convert` turns it into GGUF with llama.cpp's own converter;
`llamacpp_server` starts and stops llama.cpp's OpenAI-compatible server
(llama-cpp-python, the optional `peer` extra) and `openai_stream` times
streamed completions against it.
"""
