"""Task-side metrics, exact over all ranks: link-prediction ranking under both OGB protocols,
accuracy and ROC-AUC (:mod:`.ranking`), and a streaming, binned ROC-AUC and AP
(:mod:`.binned_auroc`). The loop's own metric reduction is :mod:`graphtrainer.loop.metrics`."""
