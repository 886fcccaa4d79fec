"""The library side of the DVC stages that train and evaluate (federate, evaluate): each function
validates its params, runs, and writes its outputs atomically. Stage scripts add MLflow logging."""
