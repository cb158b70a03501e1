"""The config as the user wrote it: config/config.yaml, each --configfile and --config read by
one reader, the file that set each key (so a message names it), and the checks that refuse a
config that cannot work, each problem in one line naming the key and the fix."""
