"""A trained picker as middleware: a Ray Serve application (:mod:`ctxpick.serve.app`), its
HTTP client (:mod:`ctxpick.serve.client`) and LangChain / LlamaIndex / Haystack components
(:mod:`ctxpick.serve.integrations`). The Python API is :class:`ctxpick.picker.inference.Picker`."""
