"""`lengthwise bench fleet`: fleets of 8 to 64 simulated executors behind one dispatcher (the
real core and policy), the arrival rate scaled with the fleet, under several placements:
throughput against linear scaling, JCT and TTFT, and what the one dispatcher costs."""
