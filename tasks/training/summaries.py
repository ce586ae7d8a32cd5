"""TensorBoard scalars without the tensorboard package (not a dependency)."""
from __future__ import annotations

from tensorflow.core.framework import summary_pb2

# The metadata tf.summary.scalar attaches, so TensorBoard shows these tensors as scalar charts.
SCALAR = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR).SerializeToString()
