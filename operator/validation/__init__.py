"""Reading RLJobs (files and the API server's objects) and every rule they are checked by: the
offline admission rules, the cluster's rules, and the problems they report."""
