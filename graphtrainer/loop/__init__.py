"""The rank side: one rank's runtime, the fit and evaluation loops, hook dispatch, exact metric
reduction, precision, profiling, loggers and seeding."""
