"""hydraplan inside other training stacks: `hydraplan.integrations.torch` balances the batches of
a framework that keeps its own homogeneous layout."""
