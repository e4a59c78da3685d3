"""What the vectors say about word senses: occurrences of a word in context and their similarities and plots
(:mod:`.polysemy`, ``elmokit similar``), and word-sense evaluation by nearest sense centroid and logistic regression
(:mod:`.senses`, CoarseWSD-20)."""
