"""bertflow's own BERT-family encoder and task heads in tf_keras (no transformers).

    config = config.EncoderConfig.from_pretrained(folder)   # BERT, DistilBERT or ELECTRA
    model = classifier.build_classifier(config, num_labels) # inside strategy.scope()
    hf_weights.load_hf_weights(model, folder, keep_head=True)  # PyTorch-layout safetensors
    logits = model(features, training=True)                 # float32 [batch, num_labels]
    model.seed_dropout(seeded_dropout.DropoutSeeds(...))    # resumable dropout masks
    hf_weights.save_hf_checkpoint(model, labels, out)       # loads in PyTorch transformers

`classifier.load_classifier` does the first three in one call. This package file imports
nothing, so that `tasks.model.config` stays free of TensorFlow (validate and the memory
check read configs in the Airflow task process).
"""
