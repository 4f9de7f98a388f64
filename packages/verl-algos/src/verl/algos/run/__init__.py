"""The run machinery shared by ``verl train`` and ``verl sft``: the run loop (``loop``), the run folder's
lock (``folder_lock``), where a run starts (``start``), its log (``log``), and the crash-safe checkpoint
layout with its manifest and value checks (``checkpoint_layout``, ``checkpoint_manifest``,
``checkpoint_values``). Tracking backends are their own registry (``verl.algos.tracking``)."""
