"""Starting runs: the simulation process, its watchdog and reaper, warm processes, Ray, the Python API."""
