"""vecplug.adapters: vector stores, retrieval modes, rerankers and integrations."""
