from example import cache_stats
