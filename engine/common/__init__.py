"""What every layer above may need: dtypes, loading a user's code, timers, overlapping work with waiting, the
hub cache's folders and the termination log a failing rank writes."""
