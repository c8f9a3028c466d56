"""After training: export to the serving formats, the exported-model runners, predict's sources and
outputs."""
