"""`lengthwise bench frontier`: one workload, several systems (each a set of config
overrides), run in the simulator; mean and tail against a plain FCFS baseline, as a table,
JSON and a plot of mean-JCT ratio vs p99-JCT ratio where a knob sweep draws a curve."""
