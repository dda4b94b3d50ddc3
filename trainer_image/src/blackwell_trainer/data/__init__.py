"""The training data: token sources, packed chat rows, chat records, data preparation inputs, the
node's S3 cache."""
