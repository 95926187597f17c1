"""Tools that run many simulations: sweeps, capacity search, comparisons, figures, tuning."""
