"""Process-level helpers every layer may use: GC pauses, torch CPU threads, argparse types."""
