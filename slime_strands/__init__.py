"""slime-strands: token-in/token-out Strands Agents rollouts on SGLang for agentic RL with slime."""
