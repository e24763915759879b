"""hydraplan: plans large-Transformer training steps on variable-length data.

The repository keeps its layers in top-level folders; they install and import under this one
namespace: ``hydraplan.planner`` (pure solver), ``hydraplan.cost_models`` (cost profiles),
``hydraplan.api`` (CLI and REST service) and ``hydraplan.runtime`` (torch workers).
"""

__version__ = "0.1.0"
