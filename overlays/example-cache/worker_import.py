from example import cache_hooks
