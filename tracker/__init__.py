"""The experiment-tracker sink (`jetrl track`): one more subscriber of the bus, writing the run's
scalars to TensorBoard, Weights & Biases or trackio. The trainer and workers know nothing of it."""
