"""Inference engines behind one interface (base.py); `make_engine` picks one from the run config."""
