"""Files the package writes and reads: atomic writes, bounded reads of foreign files, the YAML reader."""
