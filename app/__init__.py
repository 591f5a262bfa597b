"""The Gradio app of cait-lens (`python app/main.py`): see app/main.py for the command line."""
