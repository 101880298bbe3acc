"""Local mode: realise a Plan as processes on this machine (`omni up`), a sibling of render/."""
