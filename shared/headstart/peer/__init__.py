"""Peer engines: other servers run on the same weights, for side-by-side benchmarks.

`hf_export` writes a model (e.g. `random:<preset>`) as a Hugging Face
directory; `gguf_convert` turns it into GGUF with llama.cpp's own converter;
`server_build` builds llama.cpp's C++ `llama-server` (parallel slots) from
the source llama-cpp-python vendors, and `llama_server_cpp` runs it;
`llamacpp_server` runs llama-cpp-python's server (the optional `peer`
extra; one request at a time); `openai_stream` times streamed completions
against either.
"""
