"""What both screens are built from: the one table widget and its actions, the painted
text and a machine's GPU cards, and the logic under them."""
