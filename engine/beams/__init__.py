"""beams"""
