"""dp_ftrl_tff: DP-FTRL with correlated noise (tree, BandMF, BLT) for TensorFlow Federated."""

import setuptools

setuptools.setup(
    name='dp_ftrl_tff',
    version='0.1.0',
    description='DP-FTRL with correlated noise (tree aggregation, BandMF, BLT) for TensorFlow Federated',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['dp_ftrl_tff', 'dp_ftrl_tff.*', 'experiments',
                                               'experiments.*']),
    python_requires='>=3.11,<3.12',
    install_requires=[
        'absl-py>=1.4,<2',
        'dp-accounting>=0.4.3,<0.5',
        'numpy>=1.25,<1.26',
        'scipy>=1.9.3,<1.12',
        'tensorflow>=2.14,<2.15',
        'tensorflow-federated==0.87.0',
        'tensorflow-privacy>=0.9.0,<0.10',
        'matplotlib>=3.8,<3.9',
    ],
    extras_require={'test': ['pytest>=8', 'hypothesis>=6.100', 'ruff>=0.8']},
)
