"""vecplug.indexer: reading corpora, language identification, encoders and models, the indexing pipeline."""
