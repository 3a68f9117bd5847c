cached = cache_hooks.lookup(request.prompt)
if cached is not None:
    request.tokens = cached
    continue
