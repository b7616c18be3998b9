"""Noise multipliers of the configs' calibrations, as ``fedpriv.dp.accounting``'s search
returned them; written by ``python -m experiments.calibrations`` (do not edit by hand).

``TABLE[(epsilon, delta, neighboring, accountant, tol)]`` = ``((z, digest), ...)``: the
digest is ``accounting.event_digest(make_event(z))``. ``calibrate_noise_multiplier``
returns a z only if its event has that digest and epsilon(z) <= epsilon < epsilon(z - tol).
"""

TABLE = {
    (0.3225, 1e-06, 'add_remove', 'best', 0.0001): (
        # pre_text:small
        (12.142169699982201, '52824712f0bc1a527a18'),
    ),
    (1.2, 1e-06, 'add_remove', 'best', 0.0001): (
        # population_expansion:small
        (1.4152633735079594, 'e4ea8f5d51cad9bca0b4'),
        # iw_regime:small
        (1.4664342193388056, 'e6f96a82781b8488b44b'),
        # population_expansion:small
        (1.4902120127119665, '90c4e82370ea59e406e9'),
        # population_expansion:small
        (1.6304621352334712, '433acd4896f582ac1962'),
        # population_expansion:small
        (1.7462891466065829, '928f4dc78f9c2fedca5e'),
        # population_expansion:small
        (1.8810841402042056, '732b3a812d037030ece8'),
        # iw_regime:small
        (1.9105250924289805, 'e42549cf48cc542082ea'),
        # iw_regime:small
        (2.1087787598122736, '5a2e3751f4a8f1ba77d0'),
        # population_expansion:small
        (2.14375078599633, 'e53b8932cee562c19cd8'),
        # iw_regime:paper
        (23.952595413086758, '0194bd77bad41f5c2b36'),
        # iw_regime:paper
        (33.849336874568756, 'd9d798fcde840ed8a025'),
        # iw_regime:paper
        (37.40947177177002, '1e441a2e927c6b0a4d03'),
    ),
    (1.2, 1e-06, 'add_remove', 'rdp', 0.0001): (
        # population_expansion:smoke
        (1.5296148602399589, 'b11f02badbb916868df7'),
        # population_expansion:smoke
        (1.622158332169392, 'bfa2fee1a2cd8e0867a5'),
        # population_expansion:smoke
        (1.6633174276090608, 'bb63fcd712f2899e9443'),
    ),
    (1.29, 1e-06, 'add_remove', 'best', 0.0001): (
        # pre_text:small
        (3.337414398971043, 'acef1d55b2c1b1ae128b'),
        # pre_text:small
        (19.5768391086579, 'f6f4ca978fbc3ce03848'),
        # pre_text:small
        (20.484425063097273, '33d8f56bb43267f0cf43'),
    ),
    (1.77, 1e-06, 'add_remove', 'best', 0.0001): (
        # privacy_utility:smoke
        (3.7712289983210545, '9b64eb9a1e4e9b3b3503'),
        # public_training:small, wang_ablations:small
        (6.532047958533763, '0a7f9a5bcac2d043be0c'),
        # privacy_utility:paper, privacy_utility:small, public_training:paper, wang_ablations:paper
        (8.84440615913764, 'b0d7d7921cdb2a71adaf'),
        # mf_comparison:paper
        (9.544419209056603, 'afda7156c758f731e2e2'),
        # mf_comparison:paper
        (42.22885216413526, '0066e8e9dfa1f3507c1c'),
        # mf_comparison:paper
        (67.46172624505938, 'd139d3f1ead27cd4137b'),
        # mf_comparison:paper
        (320.75712757372764, 'a41c2a443898713ed541'),
    ),
    (1.895, 1e-06, 'add_remove', 'best', 0.0001): (
        # pre_text:small, pre_text:smoke
        (2.3432222172726727, 'aea4b937e61b111e0f04'),
    ),
    (2.0, 1e-06, 'add_remove', 'best', 0.0001): (
        # iw_regime:small
        (1.1027390201142762, 'aa7db8942321b933f0e8'),
        # population_expansion:small
        (1.114460727407551, '4e590bcf9c8bc7401cb7'),
        # population_expansion:small
        (1.1593705603962463, '383cecbef2888726a30a'),
        # population_expansion:small
        (1.2313420363120475, '8789c48d2534a7dc8bcb'),
        # population_expansion:small
        (1.2328908247126655, '347df38c491236d48e6b'),
        # population_expansion:small
        (1.310023937679645, '881119b2dd498be2295a'),
        # iw_regime:small
        (1.3125595675652275, 'dd672a7c46115e1310a7'),
        # iw_regime:small
        (1.3379322628248866, 'f0709fb7d9c848763664'),
        # population_expansion:small
        (1.388821930778054, '07eb4a3b7097657f76d2'),
        # iw_regime:small
        (1.4647794370053144, '43d6ee22780aa90f8c97'),
        # population_expansion:small
        (1.5179191718714082, '08708dfc7530c0966479'),
        # population_expansion:small
        (1.5270213586622623, '3df583460e882fb11012'),
        # iw_regime:small
        (3.0947165562749577, 'a7e92e9f070b860dba68'),
        # population_expansion:small
        (7.586391640868534, '281f538b9f270f9c3210'),
        # population_expansion:small
        (10.928400741137384, '96d1197ea718ef26fbfb'),
        # iw_regime:paper
        (14.99968525441224, '515e60c87ac0c0098cbb'),
        # iw_regime:paper
        (21.16832502150904, '5b3c0797301dcdac30c7'),
        # iw_regime:paper
        (21.178260293306387, '4acb4e10fc5a457ef2c1'),
        # iw_regime:paper
        (23.405190881015624, '05d15f05f6357b8652dd'),
        # iw_regime:paper
        (58.69713710356707, 'acce7f0a3dec8c149562'),
    ),
    (2.0, 1e-06, 'add_remove', 'rdp', 0.0001): (
        # population_expansion:smoke
        (1.1720977863524922, '072b7c34b8bcc5ba924e'),
        # population_expansion:smoke
        (1.246180214150677, 'ccd80a1ef54734f802d3'),
        # population_expansion:smoke
        (1.2565647179240202, '07376dbbe7afcb71978c'),
        # population_expansion:smoke
        (2.131941377674855, 'eb13a29ed504392782a1'),
    ),
    (7.58, 1e-06, 'add_remove', 'best', 0.0001): (
        # pre_text:small, pre_text:smoke
        (0.6836360931192768, '19e858dde999494256ab'),
        # pre_text:smoke
        (1.0211729306719357, '6e4e733da408a2fcab7f'),
        # pre_text:smoke
        (1.073483877132674, 'aae8bde59ef03c860c68'),
        # pre_text:small
        (3.955003799319114, 'b87abcc9d085cbac1210'),
        # pre_text:small
        (4.1572990960220055, '5923b915b23535fa16bc'),
    ),
    (18.7, 1e-06, 'add_remove', 'best', 0.0001): (
        # mf_comparison:small
        (0.4030837474266226, '3530dbd66c110a105de8'),
        # mf_comparison:small
        (0.708498541132436, '7ab6670c74034f739174'),
        # mf_comparison:small
        (0.7953864379651688, '4297c0b8aec38ae2b20b'),
        # fred_pipeline:small
        (1.130549763505361, '40a0f7a7bdbe39f8a987'),
        # fred_mixtures:small
        (1.130549763505361, 'f27612c312e9e7ae8d8b'),
        # fred_pipeline:small
        (1.1334061520958663, '16e4a0b1fdb23d0bfd4b'),
        # demo:small, lm_fl:small, lm_sweep:small, mf_comparison:small
        (1.228950440642544, '1d95029ef5cd462010b7'),
    ),
    (18.71, 1e-06, 'add_remove', 'best', 0.0001): (
        # privacy_utility:smoke, public_training:smoke
        (0.48183143184510724, 'd2e332c75c3d5ebe4ce3'),
        # wang_ablations:smoke
        (0.5901174586678505, '51e0bab41c9c69129cfa'),
        # public_training:small, wang_ablations:small
        (0.8346457552662617, 'b6c51882f22e4fdc8841'),
        # privacy_utility:paper, privacy_utility:small, public_training:paper, wang_ablations:paper
        (1.1300607266341014, 'a9ef6ae105aeb2951be3'),
    ),
    (50.0, 1e-06, 'add_remove', 'best', 0.0001): (
        # mf_comparison:smoke
        (0.19109910269267416, 'f194b2d6fd931a71b896'),
        # mf_comparison:smoke
        (0.1918837513974039, 'ec742c84173a998b88a1'),
        # lm_sweep:smoke
        (0.22916594827107428, 'd130f40071fc701e9daf'),
        # mf_comparison:smoke
        (0.22916594827107428, 'ded1b98304bdcc245c8b'),
        # mf_comparison:smoke
        (0.23617609925221247, '3f9cfbe9116bd5dfe92a'),
        # demo:smoke, lm_fl:smoke
        (0.2806643589125165, '117054074eb80dcfcefa'),
    ),
    (60.0, 1e-06, 'add_remove', 'best', 0.0001): (
        # fred_mixtures:smoke, fred_pipeline:smoke
        (0.24674607658515108, '957e7ca71e9740ee8e5b'),
        # fred_pipeline:smoke
        (0.24685455608249346, '2e59e53877ad8929bf80'),
    ),
}
