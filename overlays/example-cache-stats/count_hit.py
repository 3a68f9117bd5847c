cache_stats.record_hit()
