"""Federated EMNIST with DP-FTRL: the driver `run_emnist`, its data (`data`) and models (`models`)."""

#: The EMNIST models (`models.build_keras_model`); here, without TensorFlow, because the driver's
#: `--model` flag lists them before TensorFlow is imported.
MODELS = ('fedavg_cnn', 'tiny')
