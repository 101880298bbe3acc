"""CLI tests run the installed `omni` console script as a subprocess."""
