"""The detector benchmarks: the synthetic test video and its ground truth (`scenes`), what they share (`shared`),
detector throughput (`throughput`) and the caption budget (`caption_budget`); each runs as a module."""
