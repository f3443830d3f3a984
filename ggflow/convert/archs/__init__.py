"""One module per converted architecture family: its Hugging Face class names, metadata and tensor names."""
