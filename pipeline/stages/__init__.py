"""The stages of the pipeline, one module per DVC stage (dvc.yaml), each with a `main()`."""
