"""The built-in plugins; ``registry`` lists them by extension point and name, and the profiles."""
