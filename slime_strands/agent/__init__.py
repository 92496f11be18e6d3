"""One agent episode without slime: building and running the Strands agent, its typed record, context
compaction, sub-agents, tool limits, pacing, the history and the tracer.
"""
